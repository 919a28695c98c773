"""Stage 1: the .metallib container. Parsing, validation and writing are C++
(``csrc/metallib/``); here are the Python pieces around them: ``source`` (bytes or a path
as a zero-copy view), ``tables`` (codes <-> names), ``pack`` (new files from bitcode) and
``function_constant`` (the FunctionConstant record)."""
