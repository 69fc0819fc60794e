"""What tests in every folder share: the in-process node and owner (``node``), the loopback
webhook receiver (``receiver``) and the launcher of real ``duetime`` processes (``processes``)."""
