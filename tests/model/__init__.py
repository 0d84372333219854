"""A model of the warehouse tables, written apart from the writer, and the stateful test holding the
writer to it (docs/development.md, "The model of the tables")."""
