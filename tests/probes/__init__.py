"""Programs the tests run under real launchers (one per rank)."""
