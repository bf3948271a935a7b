"""Online evaluation, pure: what an answered recommendation earned, and sums of it.

`impression` reads an impression record (the gateway's `impressions` topic);
`outcome` credits the items of one impression with the positive events that
followed it (last touch) and scores it (CTR@k, hit rate@k, NDCG@k, AUC);
`sums` adds outcomes up per model version, degradation level, SLO class and
experiment arm, with confidence intervals. The attribution process
(services/attribution) keeps the state in Redis and calls these.
"""
