"""The deviation atlas: every optimization of the survey on one scale (the dose ratio against low
precision), beside what it buys (step time and peak memory of arm a over arm b).

``catalog`` lists the optimizations and where they run; ``plan`` turns them into one study per
backbone whose references train once; ``rows`` reads each optimization's report and costs into a
row; ``render`` writes ``atlas.json``, ``atlas.md``, ``atlas.html`` and the figure.
"""
