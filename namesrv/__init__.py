"""NameServer: milestone 2."""
