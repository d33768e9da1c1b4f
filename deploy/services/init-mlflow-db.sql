-- MLflow's tables clash with ours if they share a database (STACK.md): give it its own.
CREATE DATABASE mlflow OWNER phaselab;
