"""Who may see and change which account: roles, portal logins, API tokens."""
