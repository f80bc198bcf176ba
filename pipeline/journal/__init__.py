"""The journal worker: commands in, journal and rows out; recovery and replay."""
