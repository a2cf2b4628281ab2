"""The report's sections, one module per part of the page (each a `phaseinterp.report.section.Section`):
`profile` (phase profiles, training controls), `paper` (the profile beside the paper's published runs),
`mechanisms` (mean replacement, gate cycling, unit-level gate cycling, gate statistics), `conformance`,
`deepseek_v4`, `remedy`."""
