"""Reading answer files back into numbers: runs, metrics, audits."""
