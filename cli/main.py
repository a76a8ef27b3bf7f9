"""The `rankwatch` console script."""

def main() -> None:
    raise SystemExit("not yet")
