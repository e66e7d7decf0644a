"""The hold rules: create, charge, settle, release, expire."""
