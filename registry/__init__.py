"""Built-in components. Importing this package makes them selectable by class name in recipes."""

if __name__ != "grpokit.registry":
    raise ImportError(
        f"import grpokit.registry, not {__name__!r}: the bare folder name would load a second copy of every class"
    )
