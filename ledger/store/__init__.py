"""The store: tables, engines and sessions, the schema and its migrations."""
