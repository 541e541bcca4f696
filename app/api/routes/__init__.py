"""One router per resource; each only translates HTTP to the domain services and back."""
