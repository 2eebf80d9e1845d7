"""SWE-bench-style tasks: instances, bug synthesis from real packages, evaluation."""
