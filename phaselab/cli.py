"""Console entry point. Imports the orchestrator lazily so `phaselab --help` stays fast."""


def main() -> None:
    from phaselab.orchestrator.cli.main import app

    app()
