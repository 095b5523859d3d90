"""Real frameworks run as test oracles (see each module's docstring for what was measured)."""
