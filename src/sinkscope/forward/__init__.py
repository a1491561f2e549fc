"""forward."""
