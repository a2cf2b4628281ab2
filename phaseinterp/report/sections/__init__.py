"""The report's sections, one module per part of the page (each a `phaseinterp.report.section.Section`):
`profile` (phase profiles, training controls), `mechanisms` (mean replacement, gate cycling, unit-level
gate cycling, gate statistics), `conformance`, `deepseek_v4`, `remedy`."""
