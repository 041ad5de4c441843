"""Export page: the scenario YAML, the vllm serve command, Kubernetes manifests (in memory)."""

from __future__ import annotations

import streamlit as st

from dashboards.core import scenario_yaml
from dashboards.state import current_scenario
from sim.planning.export import kubernetes_manifests, vllm_serve_command


def main() -> None:
    st.title("Export")
    scenario, errors = current_scenario()
    if scenario is None:
        st.error("Fix the scenario first:\n\n" + "\n".join(f"- {e}" for e in errors))
        return
    model = st.text_input("Model to serve (Hugging Face id or path)", "", key="export_model")
    try:
        command = vllm_serve_command(scenario, model or None)
        manifests = kubernetes_manifests(scenario, model or None)
    except ValueError as exc:
        st.error(str(exc))
        return
    st.subheader("vllm serve")
    st.code(command, language="bash")
    st.subheader("Kubernetes")
    st.code(manifests, language="yaml")
    st.download_button("Download manifests", manifests, "servesim-k8s.yaml", key="dl_k8s")
    st.download_button("Download scenario", scenario_yaml(scenario), "scenario.yaml", key="dl_sc")


main()
