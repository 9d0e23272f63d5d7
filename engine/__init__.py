"""funnel: run LLM sales conversations as finite-state machines declared in YAML."""
