"""The append-only audit log of admin actions (who did what, when; never a data value)."""
