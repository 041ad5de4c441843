"""servesim's what-if planner: ``streamlit run dashboards/app.py`` (or ``make app``).

Pages live in ``dashboards/pages``; each also runs alone, which is how the tests drive them.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

PAGES = Path(__file__).parent / "pages"

st.set_page_config(page_title="servesim", layout="wide")
navigation = st.navigation(
    [
        st.Page(PAGES / "scenario.py", title="Scenario", default=True),
        st.Page(PAGES / "results.py", title="Results"),
        st.Page(PAGES / "compare.py", title="Compare"),
        st.Page(PAGES / "planner.py", title="Capacity planner"),
        st.Page(PAGES / "profiles.py", title="Calibration"),
        st.Page(PAGES / "export.py", title="Export"),
    ]
)
navigation.run()
