"""The people-facing surfaces: the dashboard at ``/ui/`` and the self-hosted API docs."""
