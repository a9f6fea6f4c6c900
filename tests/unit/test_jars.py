"""What `make jars` says when Maven cannot resolve a stack: Maven's first error line, without colour codes."""

from offsetlake_local.jars import _first_error


def test_maven_s_first_error_line_is_the_message():
    output = (
        "\x1b[0m\x1b[0m[ERROR] Failed to execute goal on project hive-client: org.apache.hive:hive-parser:jar:4.0.1 "
        "was not found\n[ERROR] \n[ERROR] To see the full stack trace of the errors, re-run Maven with -e.\n\x1b[0m"
    )
    assert _first_error(output) == (
        "Failed to execute goal on project hive-client: org.apache.hive:hive-parser:jar:4.0.1 was not found"
    )


def test_without_an_error_line_the_last_line_is_the_message():
    assert _first_error("downloading\nBUILD FAILURE\n\x1b[0m") == "BUILD FAILURE"
    assert _first_error("") == "(no output)"
