"""The `ninfer` and `ninfer-serve` command lines' engine side: the flag table, the capability
gates, the `ninfer` tools."""
