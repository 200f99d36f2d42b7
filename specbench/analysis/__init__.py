"""Reading answer files back into numbers: `runs` (loading, grouping), `frame` (the tidy frame
and the one speedup computation), `audit` (lossless audit, acceptance, time split), `report`
(a group analysed) and `summary` (the table after `specbench run`)."""
