"""A simulated SGLang server: real HTTP, SGLang's API, metrics and log lines, modeled GPU time."""
