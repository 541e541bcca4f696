"""The append-only privacy ledger: grants, debits and the remaining budget."""
