"""The pipeline layer: orchestration of compile, validate, learn, federate, sweep, report and the Arduino export,
below the CLI. Layer: pipeline."""
