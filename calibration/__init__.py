"""servesim calibration package (see DESIGN.md)."""
