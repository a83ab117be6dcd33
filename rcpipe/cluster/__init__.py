"""The Ray layer: the Ray Train job, a cluster's Jobs API and its runs, the search."""
