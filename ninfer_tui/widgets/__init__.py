"""The console's panels (one module each), its modal screens and their shared helpers."""
