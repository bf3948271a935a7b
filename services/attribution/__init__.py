"""The attribution process: joins impressions with the events that follow them
into online figures per model version, degradation level, SLO class and arm
(`python -m services.attribution`; docs/operations.md, *Measuring models online*)."""
