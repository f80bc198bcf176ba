"""Test support code (scripted servers, helpers). Not part of the installed package."""
