"""servesim simulator: a SimPy discrete-event model of vLLM-like serving."""
