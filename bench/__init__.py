"""`make bench`: every benchmark of the project, against baselines measured in the same run."""
