"""Security: SCRAM-SHA-256 and PLAIN authentication, the users file, ACL authorization, TLS
contexts and the authentication-failure limiter (docs/security.md). Pure except for the files
it loads: the broker, the client and the CLI move the bytes."""

from ._acl import ANONYMOUS as ANONYMOUS
from ._acl import ANY_PRINCIPAL as ANY_PRINCIPAL
from ._acl import CLUSTER_NAME as CLUSTER_NAME
from ._acl import Authorizer as Authorizer
from ._acl import Requirement as Requirement
from ._acl import is_principal as is_principal
from ._acl import principal_name as principal_name
from ._acl import required as required
from ._acl import required_for_leave as required_for_leave
from ._acl import user_principal as user_principal
from ._limiter import FailureLimiter as FailureLimiter
from ._mqtt_acl import ClientAcl as ClientAcl
from ._mqtt_acl import MqttAcl as MqttAcl
from ._mqtt_acl import MqttAclError as MqttAclError
from ._scram import MECHANISM as MECHANISM
from ._scram import MIN_ITERATIONS as MIN_ITERATIONS
from ._scram import PLAIN_MECHANISM as PLAIN_MECHANISM
from ._scram import AuthenticationFailed as AuthenticationFailed
from ._scram import ScramClient as ScramClient
from ._scram import ScramCredential as ScramCredential
from ._scram import ScramServer as ScramServer
from ._scram import derive_credential as derive_credential
from ._scram import parse_plain as parse_plain
from ._scram import plain_message as plain_message
from ._scram import verify_password as verify_password
from ._tls import ReloadingContext as ReloadingContext
from ._tls import client_context as client_context
from ._tls import server_context as server_context
from ._users import UsersFileError as UsersFileError
from ._users import UserStore as UserStore
from ._users import check_username as check_username
from ._users import import_plaintext as import_plaintext
from ._users import load_users as load_users
from ._users import save_users as save_users
