"""The bottom layer: data sets, the input stage, the ledger, C arrays and rendering, the model directory and its
safety rules, boards, budgets, errors. Imports nothing else of tinyproto. Layer: core."""
