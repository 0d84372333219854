"""What the tables are: their definitions per dialect, a record as a row and back, the companion
tables as objects. Imports no other room of the warehouse (docs/architecture.md, "Inside warehouse/")."""
