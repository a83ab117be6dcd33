"""Official scoring and the paired comparison of two models' answers (pure: no torch)."""
