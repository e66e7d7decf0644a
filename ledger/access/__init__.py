"""Who may see and change which account:

    identity   member roles, portal logins and sessions, API tokens (roles_of,
               member_roles, set_portal_user, portal_user, end_portal_sessions,
               create_token, authenticate_token, list_tokens, revoke_token)
    credentials  credentials that may be used once (spend_credential): the portal's
               MUNGE authentication

On top of the books (accounts and members).
"""
