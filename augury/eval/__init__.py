"""Quality evaluations (`augury eval ...`)."""
