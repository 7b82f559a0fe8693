"""The image entrypoint's parts, one job each (image/entrypoint.py is the script that dispatches to them):

    settings     the invocation and the environment it reads, parsed and refused with one message
    host         the seam to the node's facts (commands, PATH, sysfs), which tests point at fakes
    selftest     the node checks and the allreduce rank they run
    supervisor   sshd mode's PID 1: sshd as a child, SIGTERM forwarded to the trainers

Standard library only (they run before anything else is known to work on the node).
"""
