"""A Jupyter server authorizer for tests/hub/test_course_sessions.py: everything but running kernels."""

from jupyter_server.auth.authorizer import Authorizer


class ReadOnly(Authorizer):
    def is_authorized(self, handler, user, action, resource):
        return not (action == "execute" and resource == "kernels")
