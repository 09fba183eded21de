"""How a command's process runs: its start (`runtime`: flags, library logs, the platform), its end
(`exits`: signals, interruptions, a closed output) and the modules of yours it imports
(`extensions`). The bottom layer: it imports no other package of vit_jax."""
