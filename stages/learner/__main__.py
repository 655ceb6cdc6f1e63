"""`python -m stages.learner [--name NAME] [--from FILE ...|-]`: the draft on stdout."""
from stages.learner.commands import learn_command

if __name__ == "__main__":
    learn_command(prog_name="python -m stages.learner")
