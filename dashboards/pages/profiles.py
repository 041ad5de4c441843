"""Calibration page (profiles.py: a page named calibration.py would shadow the calibration
package when Streamlit runs it): a profile's fit and a validation report."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from calibration.fit import point_kind
from dashboards.core import MAX_SCENARIO_BYTES
from sim.engine.profile import Profile

SHIPPED = Path(__file__).parents[2] / "profiles"


def _load(content: bytes) -> Profile | str:
    if len(content) > 4 * MAX_SCENARIO_BYTES:
        return "profile: larger than 1 MB"
    try:
        return Profile.model_validate_json(content)
    except ValueError as exc:
        first = str(exc).splitlines()[:3]
        return "profile: not a valid servesim profile: " + " ".join(first)


def main() -> None:
    st.title("Calibration")
    shipped = sorted(p.name for p in SHIPPED.glob("*.json")) if SHIPPED.is_dir() else []
    choice = st.selectbox("Shipped profile", ["(upload instead)", *shipped], key="profile_pick")
    upload = st.file_uploader("Profile JSON", type=["json"], key="profile_upload")
    content: bytes | None = None
    if upload is not None:
        content = upload.getvalue()
    elif choice != "(upload instead)":
        content = (SHIPPED / choice).read_bytes()
    if content is None:
        st.info("Pick a shipped profile or upload one written by `servesim calibrate`.")
        return
    profile = _load(content)
    if isinstance(profile, str):
        st.error(profile)
        return
    st.write(
        f"**{profile.model}** on **{profile.hardware}**, TP {profile.tensor_parallel_size}, "
        f"{profile.dtype}; {profile.engine.name} {profile.engine.version}; {profile.created}"
    )
    fit = profile.fit
    cols = st.columns(3)
    cols[0].metric("fit error mean", f"{fit.relative_error_mean:.1%}")
    cols[1].metric("fit error p90", f"{fit.relative_error_p90:.1%}")
    cols[2].metric("points", f"{fit.num_points}")
    st.dataframe(
        pd.DataFrame([asdict(profile.coefficients)]).T.rename(columns={0: "seconds"}),
        key="coefficients",
    )
    points = pd.DataFrame(fit.points)
    if not points.empty and {"measured_s", "predicted_s"} <= set(points.columns):
        points["kind"] = [point_kind(p) for p in fit.points]
        figure = go.Figure()
        for kind, group in points.groupby("kind"):
            figure.add_trace(
                go.Scatter(
                    x=group["measured_s"] * 1e3,
                    y=group["predicted_s"] * 1e3,
                    mode="markers",
                    name=str(kind),
                )
            )
        top = float(max(points["measured_s"].max(), points["predicted_s"].max()) * 1e3)
        figure.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="exact"))
        figure.update_layout(xaxis_title="measured (ms)", yaxis_title="predicted (ms)")
        st.plotly_chart(figure, key="fit_scatter")
    for note in fit.notes:
        st.caption(note)
    report = st.file_uploader("Validation report (report.json)", type=["json"], key="report")
    if report is not None:
        try:
            document = json.loads(report.getvalue()[: 4 * MAX_SCENARIO_BYTES])
            rows = pd.DataFrame(document["rows"])
        except (ValueError, KeyError, TypeError):
            st.error("report: not a servesim validate report.json")
            return
        st.write("passed" if document.get("passed") else "over the bounds")
        st.dataframe(rows, key="report_rows")


main()
