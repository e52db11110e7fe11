"""Python client for the broker: milestone 2. The DLedger client is dledger.client."""
