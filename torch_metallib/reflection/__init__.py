"""Stage 2: reflection, what a kernel's AIR bitcode says about calling it (``reflect``),
read from the printed module (``air_text``; function bodies through ``ir_model``, the one
reader of them for every stage after this one), one argument node at a time
(``air_arguments``), and shown as a Metal-like declaration (``signature``)."""
