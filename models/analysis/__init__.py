"""Pure math on results: rollout, attention distance, entropy, alignment error, routing statistics."""
