# agentstream: the two commands of the README, and a few for daily work.
.PHONY: demo test install lint bench up down

demo:            ## install everything, start the local stack, talk to an agent, stop
	scripts/install.sh --model
	.venv/bin/agentstream demo

test:            ## the whole test suite (starts and stops the local broker and model)
	scripts/test.sh

install:
	scripts/install.sh

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

bench:
	.venv/bin/python bench/reduce.py
	.venv/bin/python bench/journal.py
