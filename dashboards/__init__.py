"""servesim dashboards package (see DESIGN.md)."""
