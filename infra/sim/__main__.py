"""`python -m infra.sim <sglang flags>`: start one simulated SGLang server."""

from infra.sim.server import main

if __name__ == "__main__":
    main()
