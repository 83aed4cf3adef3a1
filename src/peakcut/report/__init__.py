"""Human-facing output: tables, profiles and plots."""
