"""On request, beside the runs: erasure, a stricter personal-data policy applied to stored rows, and the
space they free given back (docs/architecture.md, "Inside warehouse/")."""
