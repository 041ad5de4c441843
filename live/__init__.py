"""servesim live package (see DESIGN.md)."""
